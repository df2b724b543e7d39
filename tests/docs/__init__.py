"""What the repository tells its readers holds: README's and docs/'s code blocks run, the examples and benchmark scripts run as users run them, and the text points only at files that exist."""
