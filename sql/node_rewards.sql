-- Eq. 1 of RAO, one row per node of one round:
--   R(X) = s(X) + lambda * mean_{c in C(X)} s(c)      (the second term is 0 when X has no children)
-- The children's term uses their BASE success s(c), never R(c), so bonuses do not compound up the
-- tree; the mean (not the count) means spawning more children earns nothing by itself. Every child
-- row present counts, whatever its status. A NULL success counts as 0.
-- file_row_number keeps the input order so the scores file lines up with the nodes file.
-- Parameters: $nodes_path (that round's nodes.parquet, read by path, never by a hive filter), $lam.
CREATE OR REPLACE TEMP TABLE node_rewards AS
WITH n AS (
    SELECT file_row_number AS row_nr, run, round, task_id, tree_id, node_id, parent_id, depth,
           status, tree_status, coalesce(success, 0)::DOUBLE AS success
    FROM read_parquet($nodes_path, file_row_number = true)
),
kids AS (
    SELECT parent_id, avg(success) AS child_mean
    FROM n
    WHERE parent_id IS NOT NULL
    GROUP BY parent_id
)
SELECT n.*, n.success + $lam::DOUBLE * coalesce(kids.child_mean, 0.0) AS reward
FROM n LEFT JOIN kids ON kids.parent_id = n.node_id;
