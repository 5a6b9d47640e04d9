-- The round's groups (root tasks) by what RL can learn from them (rao_core.scoring.scores_summary):
--   spread        some trained node has a nonzero advantage: a gradient
--   all_failed    no spread, and every valid root has success 0
--   all_succeeded no spread, and every valid root has success 1
--   no_spread     no spread otherwise (equal partial scores, or a lone valid tree)
--   no_valid      every tree timed out, failed infrastructure or was stale
-- Reads a `scores` table of one round.
WITH groups AS (
    SELECT task_id,
           bool_or(trained AND advantage <> 0) AS spread,
           count(*) FILTER (WHERE parent_id IS NULL AND drop_reason IS DISTINCT FROM 'timeout'
                            AND drop_reason IS DISTINCT FROM 'infra_error'
                            AND drop_reason IS DISTINCT FROM 'stale') AS valid_roots,
           min(success) FILTER (WHERE parent_id IS NULL AND drop_reason IS DISTINCT FROM 'timeout'
                                AND drop_reason IS DISTINCT FROM 'infra_error'
                                AND drop_reason IS DISTINCT FROM 'stale') AS lo,
           max(success) FILTER (WHERE parent_id IS NULL AND drop_reason IS DISTINCT FROM 'timeout'
                                AND drop_reason IS DISTINCT FROM 'infra_error'
                                AND drop_reason IS DISTINCT FROM 'stale') AS hi
    FROM scores
    GROUP BY task_id
)
SELECT count(*) AS groups,
       count(*) FILTER (WHERE spread) AS spread,
       count(*) FILTER (WHERE NOT spread AND valid_roots > 0 AND hi = 0) AS all_failed,
       count(*) FILTER (WHERE NOT spread AND valid_roots > 0 AND lo = 1) AS all_succeeded,
       count(*) FILTER (WHERE NOT spread AND valid_roots > 0 AND NOT (hi = 0 OR lo = 1)) AS no_spread,
       count(*) FILTER (WHERE NOT spread AND valid_roots = 0) AS no_valid
FROM groups;
