"""One PostgreSQL store per feature, named as the feature."""
