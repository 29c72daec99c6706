-- The log of re-admissions (CONTRACT.md §10): each run that validated quarantined
-- records again under the contract version the lake runs, and what became of them.
CREATE TABLE control.readmissions (
    readmission_id    text        PRIMARY KEY CHECK (readmission_id ~ '^[0-9a-f]{32}$'),
    source            text        NOT NULL,
    -- The quarantine reason whose records were examined.
    reason            text        NOT NULL,
    -- The source's contract version that judged them (and admitted those that passed).
    contract_version  integer     NOT NULL CHECK (contract_version >= 1),
    requested_at      timestamptz NOT NULL DEFAULT now(),
    completed_at      timestamptz,
    requested_by      text        NOT NULL,
    status            text        NOT NULL DEFAULT 'running'
        CHECK (status IN ('running', 'done', 'failed')),
    examined          bigint,
    admitted          bigint,
    -- Still quarantined, by the reason each fails by now, e.g. {"total_mismatch": 3}.
    still_quarantined jsonb       NOT NULL DEFAULT '{}'::jsonb,
    error             text
);
