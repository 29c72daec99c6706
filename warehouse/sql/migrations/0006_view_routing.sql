-- What a serving view routes by, as one relation (issue 67): the live versions
-- of each view with their status and share, and every pin as a row of its own
-- (status 'pinned', user_name set). Each serving view reads it once per query,
-- filtered to its view, its live versions and the asking user, and folds it into
-- one route in a single aggregate. Two scans (versions, pins), each inlined into
-- every version's branch, had cost Trino about 0.15 CPU-s more per query.
-- Analysts cannot read it (it holds everyone's pins); serving views run as
-- their owner.
CREATE VIEW control.view_routing AS
    SELECT view_name, version, status, rollout_percent, CAST(NULL AS text) AS user_name
    FROM control.view_versions
    WHERE status IN ('ready', 'serving')
    UNION ALL
    SELECT view_name, version, 'pinned', 0, user_name
    FROM control.view_pins;
