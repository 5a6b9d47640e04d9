-- Eq. 4 of RAO, one row per depth present among the round's TRAINED nodes:
--   N_d = trained nodes at depth d,  alpha = (sum_d N_d) / (number of depths present),  w_d = alpha / N_d
-- so every depth carries the same total weight and the batch's total weight is unchanged. Depths
-- with no trained node (gaps included) are not "present". $depth_weighting = false gives w_d = 1.
-- Reads the temp tables node_rewards and tree_baselines (joined on the integer tree key).
CREATE OR REPLACE TEMP TABLE depth_counts AS
WITH counts AS (
    SELECT r.depth, count(*) AS n_d
    FROM node_rewards r SEMI JOIN tree_baselines t ON t.tree_key = r.tree_key AND t.drop_reason IS NULL
    GROUP BY r.depth
),
alpha AS (
    SELECT depth, n_d, sum(n_d) OVER ()::DOUBLE / count(*) OVER () AS alpha FROM counts
)
SELECT depth, n_d, alpha,
       CASE WHEN $depth_weighting THEN alpha / n_d ELSE 1.0 END AS w
FROM alpha;
