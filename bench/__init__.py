"""`make bench`: clawq against bare Celery and raw Redis, measured in the same run."""
