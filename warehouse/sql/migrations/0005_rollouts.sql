-- Automatic rollouts (issue 69): one row per rollout a person started with
-- `regauge autorollout` or the regauge_autorollout DAG. The row is the state
-- machine: a driver killed at any point resumes from it, not from its memory.
-- Every decision is also a row of control.view_events, with its gate figures.
CREATE TABLE control.rollouts (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    view_name       text        NOT NULL CHECK (view_name ~ '^[a-z][a-z0-9_]{0,62}$'),
    -- The candidate, and the version serving when the rollout started: what the
    -- candidate must agree with, and where everyone goes back to.
    version         integer     NOT NULL CHECK (version >= 1),
    current_version integer     NOT NULL CHECK (current_version >= 1),
    steps           integer[]   NOT NULL CHECK (cardinality(steps) >= 1),
    hold_s          double precision NOT NULL CHECK (hold_s >= 0),
    thresholds      jsonb       NOT NULL,
    -- The index in `steps` of the step reached; -1 before the first move.
    step            integer     NOT NULL DEFAULT -1,
    -- When the step reached began to hold: the gates judge what happened since.
    step_at         timestamptz,
    state           text        NOT NULL DEFAULT 'running'
        CHECK (state IN ('running', 'completed', 'rolled_back', 'stopped')),
    why             text        NOT NULL DEFAULT '',
    -- Who asked for a stop; the driver ends the rollout where it is.
    stop_by         text,
    started_by      text        NOT NULL,
    -- The caller's id for the request (e.g. the Airflow run): a retry of the same
    -- request finds its rollout, running or ended, instead of starting another.
    request_id      text UNIQUE CHECK (request_id ~ '^[A-Za-z0-9_.:+-]{1,250}$'),
    started_at      timestamptz NOT NULL DEFAULT now(),
    ended_at        timestamptz
);

-- At most one running rollout per view: two drivers would fight over the percent.
CREATE UNIQUE INDEX rollouts_one_running ON control.rollouts (view_name)
    WHERE state = 'running';
