-- The structural checks of checks.sql on the string ids, naming the offenders (at most 10 rows).
-- Slow (it materialises the strings), so scoring.py runs it only after checks.sql found a problem.
-- Parameter: $nodes_path.
WITH n AS MATERIALIZED (
    SELECT tree_id, task_id, node_id, parent_id, depth FROM read_parquet($nodes_path)
)
SELECT 'duplicate node_id ' || node_id AS problem
FROM n GROUP BY node_id HAVING count(*) > 1
UNION ALL
SELECT 'tree ' || tree_id || ': ' || count(*) FILTER (WHERE parent_id IS NULL) || ' roots, '
       || count(DISTINCT task_id) || ' task ids, root depth '
       || coalesce(CAST(any_value(depth) FILTER (WHERE parent_id IS NULL) AS VARCHAR), 'none')
FROM n GROUP BY tree_id
HAVING count(*) FILTER (WHERE parent_id IS NULL) != 1
    OR count(DISTINCT task_id) != 1
    OR any_value(depth) FILTER (WHERE parent_id IS NULL) != 0
UNION ALL
SELECT 'node ' || c.node_id || ' (tree ' || c.tree_id || ') has parent ' || p.node_id || ' in tree ' || p.tree_id
FROM n c JOIN n p ON c.parent_id = p.node_id
WHERE c.tree_id != p.tree_id
LIMIT 10;
