-- Eq. 1 of RAO, one row per node of one round:
--   R(X) = s(X) + lambda * mean_{c in C(X)} s(c)      (the second term is 0 when X has no children)
-- The children's term uses their BASE success s(c), never R(c), so bonuses do not compound up the
-- tree; the mean (not the count) means spawning more children earns nothing by itself. Every child
-- row present counts, whatever its status. A NULL success counts as 0.
--
-- Speed: the ids are strings, but every join and group of the scoring runs on 64-bit keys,
-- hash(id) as UBIGINT: reading them costs about a third of materialising the strings, and integer
-- hash tables are smaller and faster. A collision would silently merge two ids, so checks.sql makes
-- any collision an error (count(DISTINCT hash) = count(DISTINCT id) per key space). No string
-- column is read here: scoring.py copies the id columns of the output from the nodes file by
-- position. (file_index, file_row_number) keeps the input order so the scores line up with the
-- nodes file, or with the shards' files of a sharded round read as one list in shard order.
-- kids_in_tree: the node's children (if any) all carry its tree_id; a parent_id whose hash
-- collides with a node of another tree breaks it, so checks.sql refuses that too.
-- staleness: the version this round trains (its round r: the update takes v_r to v_r+1) minus the
-- version that sampled the node (policy_version; campaign.max_staleness k samples round r with
-- max(0, r - k)). A row with no version is as old as the version it trains.
-- Parameters: $nodes_path (that round's nodes.parquet, or its shards' files as a list, read by path,
-- never by a hive filter), $lam, $trained_version.
CREATE OR REPLACE TEMP TABLE node_rewards AS
WITH n AS MATERIALIZED (
    SELECT (file_index::UBIGINT << 40) + file_row_number AS row_nr,
           hash(node_id) AS node_key,
           CASE WHEN parent_id IS NOT NULL THEN hash(parent_id) END AS parent_key,  -- NULL: root
           hash(tree_id) AS tree_key,
           hash(task_id) AS task_key,
           depth,
           coalesce(tree_status = 'timeout', false) AS timed_out,
           coalesce(tree_status = 'infra_error', false) AS infra_failed,
           status IS DISTINCT FROM 'finished' AS unfinished,
           coalesce(success, 0)::DOUBLE AS success,
           $trained_version::INTEGER - coalesce(policy_version, $trained_version::INTEGER) AS staleness
    FROM read_parquet($nodes_path, file_row_number = true)
),
kids AS (
    SELECT parent_key, avg(success) AS child_mean, min(tree_key) AS tree_lo, max(tree_key) AS tree_hi
    FROM n
    WHERE parent_key IS NOT NULL
    GROUP BY parent_key
)
SELECT n.*,
       n.success + $lam::DOUBLE * coalesce(kids.child_mean, 0.0) AS reward,
       kids.parent_key IS NULL OR (kids.tree_lo = n.tree_key AND kids.tree_hi = n.tree_key) AS kids_in_tree
FROM n LEFT JOIN kids ON kids.parent_key = n.node_key;
