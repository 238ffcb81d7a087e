-- The event log lives in events.db from now on (migrations/events/).
-- Store::open copies these rows there before this runs.
DROP TABLE IF EXISTS events;
