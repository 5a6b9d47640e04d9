-- Eq. 4 per round: trained nodes per depth (N_d), their weight w_d and total weight N_d * w_d.
SELECT round, depth, count(*) AS n_d, round(any_value(depth_weight), 4) AS w_d,
       round(count(*) * any_value(depth_weight), 2) AS total_weight
FROM scores
WHERE trained
GROUP BY round, depth
ORDER BY round, depth;
