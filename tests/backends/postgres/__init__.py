"""What only the PostgreSQL backend does, and what needs the PostgreSQL server: its SQL and plans, infra's psycopg bridge, server failures, and the suite's throwaway databases."""
