-- The log of erasures (CONTRACT.md §8): who asked, when, why, and how many rows
-- each layer lost. It holds no personal data: never the customer's id.
CREATE TABLE control.erasures (
    erasure_id   text        PRIMARY KEY CHECK (erasure_id ~ '^[0-9a-f]{32}$'),
    requested_at timestamptz NOT NULL DEFAULT now(),
    completed_at timestamptz,
    -- The operator's words, limited to what cannot smuggle in much (see
    -- warehouse.sql.erasures.check_reason).
    reason       text        NOT NULL CHECK (length(reason) BETWEEN 1 AND 200),
    requested_by text        NOT NULL,
    status       text        NOT NULL DEFAULT 'running'
        CHECK (status IN ('running', 'done', 'failed')),
    -- The step reached, for the log and for a rerun.
    phase        text,
    -- Rows removed per layer, e.g. {"lakehouse.silver.shop_events": 12, ...}.
    removed      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    error        text
);
