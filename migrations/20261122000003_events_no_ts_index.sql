-- Expiry finds its cutoff by walking ids (they follow time), so the
-- ts_ms index only cost every event insert a third B-tree write.
DROP INDEX IF EXISTS events_ts;
