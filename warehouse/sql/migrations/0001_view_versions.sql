-- The version registry (CONTRACT.md §4): one row per view version, and the
-- users pinned to a version. Analysts see it through Trino as ops.control.*.
CREATE TABLE control.view_versions (
    view_name       text        NOT NULL CHECK (view_name ~ '^[a-z][a-z0-9_]{0,62}$'),
    version         integer     NOT NULL CHECK (version >= 1),
    status          text        NOT NULL
        CHECK (status IN ('building', 'ready', 'serving', 'retired', 'failed')),
    -- Share of (unpinned) users routed to this version: the candidate's
    -- percent and the current version's complement always add up to 100.
    rollout_percent integer     NOT NULL DEFAULT 0 CHECK (rollout_percent BETWEEN 0 AND 100),
    created_at      timestamptz NOT NULL DEFAULT now(),
    ready_at        timestamptz,
    retired_at      timestamptz,
    -- What part of the log the version was built from, e.g. silver@42.
    source_position text,
    -- The validation gate's report.
    validation      jsonb,
    PRIMARY KEY (view_name, version)
);

-- At most two live versions: one current (serving) and one candidate (ready),
-- and one build at a time. The database holds the rule, so no race between two
-- commands can break it. Deferred to commit time, because a rollout to 100 %
-- swaps the two live versions' roles in one transaction.
ALTER TABLE control.view_versions
    ADD CONSTRAINT view_versions_one_serving
        EXCLUDE USING btree (view_name WITH =) WHERE (status = 'serving')
        DEFERRABLE INITIALLY DEFERRED,
    ADD CONSTRAINT view_versions_one_candidate
        EXCLUDE USING btree (view_name WITH =) WHERE (status = 'ready')
        DEFERRABLE INITIALLY DEFERRED,
    ADD CONSTRAINT view_versions_one_building
        EXCLUDE USING btree (view_name WITH =) WHERE (status = 'building')
        DEFERRABLE INITIALLY DEFERRED;

CREATE TABLE control.view_pins (
    view_name text        NOT NULL,
    user_name text        NOT NULL CHECK (user_name ~ '^[a-z][a-z0-9_.@-]{0,63}$'),
    version   integer     NOT NULL,
    pinned_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (view_name, user_name),
    FOREIGN KEY (view_name, version) REFERENCES control.view_versions (view_name, version)
);

-- What happened, in order: every registration, status change, rollout and pin.
CREATE TABLE control.view_events (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    view_name text        NOT NULL,
    version   integer     NOT NULL,
    action    text        NOT NULL,
    detail    text        NOT NULL DEFAULT '',
    at        timestamptz NOT NULL DEFAULT now()
);
