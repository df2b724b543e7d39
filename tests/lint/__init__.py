"""The lint's own tests: nursery_jobs_lint's rules, CLI, configuration and flake8 plugin."""
