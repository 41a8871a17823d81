"""The PostgreSQL store: jobs, sessions, transcripts, the durable ledger, and the migrations."""
