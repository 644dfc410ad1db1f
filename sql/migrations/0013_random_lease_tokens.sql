-- 0013: lease tokens drawn at random, so that no failover can hand one out twice. A token
-- was the todo's previous one + 1: a replica promoted after losing the primary's last
-- claims handed out the same numbers again, and a stale holder's ack was accepted. Now
-- each claim draws a token at random from [1, 2^53 - 1] (an exact integer in JSON for
-- every language), never the todo's current one: two claims of a todo share a token with
-- a chance of about 2^-53, whichever server made them. Tokens handed out before stay
-- valid until the todo's next claim. random() has 52 random bits (PostgreSQL 15 to 18),
-- so two draws make the 53. PostgreSQL inlines the function into the claim statements.
CREATE FUNCTION todo_lease_token(previous bigint) RETURNS bigint
    LANGUAGE sql VOLATILE PARALLEL SAFE
    RETURN (previous + (floor(random() * 4503599627370496)::bigint * 2 + floor(random() * 2)::bigint)
                       % 9007199254740990) % 9007199254740991 + 1;
