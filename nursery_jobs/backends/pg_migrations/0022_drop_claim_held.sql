-- nursery_jobs schema, version 22: `claim_held`, which nothing calls, goes.
--
-- Its only callers were the claims of a runtime of version 6 to 12; from version 13 on the claim
-- statement calls `claim_picked` (and from 14 `claim_picked_parking`) instead, and no function
-- calls it. The runtimes a deploy of this version can meet are those the schema serves since
-- version 18, 13 and later, and none of them calls it. Every other function is called by a
-- statement of such a runtime or by a function one calls. (A brief catalog lock, none on `jobs`.)
DROP FUNCTION {schema}.claim_held(bigint[], text, integer, integer, double precision);
