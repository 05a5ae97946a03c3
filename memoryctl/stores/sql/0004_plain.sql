-- Without TimescaleDB `memoryctl stats` reads `memories` directly (date_bin over the BRIN-indexed
-- created_at): there is no aggregate to create. Recorded all the same, so both paths share versions.
SELECT 1;
