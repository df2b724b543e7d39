-- nursery_jobs schema, version 3: job arguments are stored as the exact JSON text the runtime
-- encoded. jsonb normalises what it stores: 1e16 and 1.2345678901234567e+19 come back as
-- integers, -0.0 as 0, and it refuses "\u0000" and lone surrogate escapes that memory and SQLite
-- keep. The library never queries inside the arguments; every backend now returns them exactly.
-- The text is what Python's json module wrote (ASCII only, no raw NUL), so `text` holds any of
-- it. (This rewrites the table: on a large one, run it in a quiet moment.)
ALTER TABLE {schema}.jobs ALTER COLUMN args TYPE text USING args::text;
