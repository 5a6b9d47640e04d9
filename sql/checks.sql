-- Structural checks scoring relies on, one row per kind of problem (none for a well-formed round):
-- node_id unique; every tree has exactly one root (parent_id NULL, at depth 0) and one task_id; a
-- node's children are in its tree; and no two distinct ids share a 64-bit hash key in any key space
-- (node_id, tree_id, task_id), so a collision is an error, never a silently merged group.
-- Works on the keys (temp tables node_rewards, trees) plus one scan of the two dictionary-encoded
-- id columns of the file, so it costs little. The messages cannot name ids; when a row comes back,
-- scoring.py runs checks_named.sql over the strings to name them (no name found: a collision).
-- Parameter: $nodes_path.
WITH nodes AS (
    SELECT count(*) AS n, count(DISTINCT node_key) AS node_keys FROM node_rewards
),
ids AS (
    SELECT count(DISTINCT tree_id) AS tree_ids, count(DISTINCT hash(tree_id)) AS tree_keys,
           count(DISTINCT task_id) AS task_ids, count(DISTINCT hash(task_id)) AS task_keys
    FROM read_parquet($nodes_path)
),
bad_trees AS (
    SELECT count(*) FILTER (WHERE roots != 1 OR root_depth != 0 OR task_key != task_hi) AS malformed,
           count(*) FILTER (WHERE NOT kids_in_tree) AS split_parents
    FROM trees
)
SELECT 'duplicate node_id: ' || (n - node_keys) || ' rows (or a node_id hash collision)'
FROM nodes WHERE node_keys != n
UNION ALL
SELECT malformed || ' trees without exactly one root at depth 0 and one task id' FROM bad_trees WHERE malformed > 0
UNION ALL
SELECT split_parents || ' nodes with children in another tree' FROM bad_trees WHERE split_parents > 0
UNION ALL
SELECT 'tree_id hash collision: ' || tree_ids || ' ids, ' || tree_keys || ' keys' FROM ids WHERE tree_ids != tree_keys
UNION ALL
SELECT 'task_id hash collision: ' || task_ids || ' ids, ' || task_keys || ' keys' FROM ids WHERE task_ids != task_keys;
