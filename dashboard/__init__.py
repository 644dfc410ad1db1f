"""switchboard: a durable work-queue on PostgreSQL with a live operator dashboard."""
