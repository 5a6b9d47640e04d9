-- Structural checks scoring relies on, one row per problem (none for a well-formed round):
-- node_id unique, and every tree has exactly one root (parent_id NULL, at depth 0) and one task_id.
-- Reads the temp table node_rewards (so the Parquet file is read once).
SELECT 'duplicate node_id ' || node_id AS problem
FROM node_rewards GROUP BY node_id HAVING count(*) > 1
UNION ALL
SELECT 'tree ' || tree_id || ': ' || count(*) FILTER (WHERE parent_id IS NULL) || ' roots, '
       || count(DISTINCT task_id) || ' task ids, root depth '
       || coalesce(CAST(any_value(depth) FILTER (WHERE parent_id IS NULL) AS VARCHAR), 'none')
FROM node_rewards GROUP BY tree_id
HAVING count(*) FILTER (WHERE parent_id IS NULL) != 1
    OR count(DISTINCT task_id) != 1
    OR any_value(depth) FILTER (WHERE parent_id IS NULL) != 0
LIMIT 10;
