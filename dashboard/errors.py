"""Every error the store raises: one root class, translated to HTTP in one place (web)."""


class SwitchboardError(Exception):
    """Root of every error switchboard raises on purpose."""


class NotFound(SwitchboardError):
    """No todo (or other object) has that id."""


class Conflict(SwitchboardError):
    """The object exists but its state does not allow the transition."""

    def __init__(self, message: str, *, current: dict | None = None):
        super().__init__(message)
        self.current = current or {}


class Stale(Conflict):
    """An edit named a version of the todo (what its caller read) that is no longer the
    todo's: something changed it since. `current` says what, and the version now."""


class Cancelled(Conflict):
    """The todo was cancelled while its holder held it: the holder should stop its work.
    Its problem details carry the type PROBLEM_CANCELLED, so a worker can tell it apart."""

    problem_type = "/problems/cancelled"


class OutOfScope(SwitchboardError):
    """The todo is in a queue the caller's API token does not cover."""


class Revoked(SwitchboardError):
    """The caller's token was revoked while its call waited (a long-poll claim, a wait)."""


class NotAllowed(SwitchboardError):
    """The caller may see the todo but not do this to it (an agent reassigning a todo held
    for a person)."""


class InvalidInput(SwitchboardError):
    """An argument is out of bounds or malformed; names the field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.fields = {field: message}  # every field's problem, when checks went on (models.Problems)


class DatabaseUnavailable(SwitchboardError):
    """The database cannot be reached, is read-only, or its URL is malformed: try again later.
    `public` is what a client may be told: the message, unless it names hosts or repeats
    the driver's text (those go to the log)."""

    def __init__(self, message: str, *, public: str | None = None):
        super().__init__(message)
        self.public = public or message


class StatementCancelled(DatabaseUnavailable):
    """The database stopped a statement (a statement_timeout, pg_cancel_backend): busy, as
    far as the caller can tell, but the connection is as good as before."""


class MigrationError(SwitchboardError):
    """A migration file disagrees with what the database recorded."""


class TooLarge(InvalidInput):
    """A payload, result or batch is over its size limit."""
