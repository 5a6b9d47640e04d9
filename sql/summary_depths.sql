-- N_d and w_d of Eq. 4 in one scored round: trained nodes per depth and their depth weight.
SELECT depth, count(*) AS n_d, any_value(depth_weight) AS w_d
FROM scores
WHERE trained
GROUP BY depth
ORDER BY depth;
