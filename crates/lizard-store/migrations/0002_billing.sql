-- Billing: the account ledger, its running balance, and the per-sandbox meters that feed it.
-- Amounts are signed nano-dollars (10^-9 USD) in INTEGER columns; timestamps are ms.

-- Append-only: every credit and every metered interval is one row, never changed.
-- `seq` orders the ledger (and is the pagination cursor); ids are what clients see.
-- No foreign keys to workspaces, projects or sandboxes: the ledger outlives them.
CREATE TABLE ledger (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,
    id               TEXT NOT NULL UNIQUE,
    account_id       TEXT NOT NULL REFERENCES accounts(id),
    kind             TEXT NOT NULL CHECK (kind IN ('signup_credit', 'credit', 'usage')),
    amount_nanos     INTEGER NOT NULL,
    description      TEXT NOT NULL,
    workspace_id     TEXT,
    project_id       TEXT,
    sandbox_id       TEXT,
    usage_kind       TEXT CHECK (usage_kind IN ('compute', 'paused_storage')),
    period_start     INTEGER,
    period_end       INTEGER,
    quantity_ms      INTEGER,
    nanos_per_second INTEGER,
    idempotency_key  TEXT,
    created_at       INTEGER NOT NULL,
    UNIQUE (account_id, idempotency_key)
);
CREATE INDEX ledger_account ON ledger (account_id, seq);
CREATE INDEX ledger_project ON ledger (account_id, project_id) WHERE kind = 'usage';

CREATE TRIGGER ledger_no_update BEFORE UPDATE ON ledger
BEGIN
    SELECT RAISE(ABORT, 'the ledger is append-only');
END;
CREATE TRIGGER ledger_no_delete BEFORE DELETE ON ledger
BEGIN
    SELECT RAISE(ABORT, 'the ledger is append-only');
END;

-- The balance, kept by the database itself in the same statement as each ledger insert,
-- so it equals SUM(ledger.amount_nanos) at every commit. `depleted_at`: when it last
-- reached zero or below (NULL while positive); sandboxes are paused a grace period later.
CREATE TABLE account_balances (
    account_id    TEXT PRIMARY KEY REFERENCES accounts(id),
    balance_nanos INTEGER NOT NULL,
    depleted_at   INTEGER
);
CREATE TRIGGER ledger_balance AFTER INSERT ON ledger
BEGIN
    INSERT INTO account_balances (account_id, balance_nanos, depleted_at)
    VALUES (NEW.account_id, NEW.amount_nanos, CASE WHEN NEW.amount_nanos <= 0 THEN NEW.created_at END)
    ON CONFLICT (account_id) DO UPDATE SET
        balance_nanos = balance_nanos + NEW.amount_nanos,
        depleted_at = CASE
            WHEN balance_nanos + NEW.amount_nanos > 0 THEN NULL
            ELSE COALESCE(depleted_at, NEW.created_at)
        END;
END;

-- One meter per sandbox: what it costs in each state, and up to when it has been billed.
-- `state` running|paused|ended; `billed_until` is the watermark of the open interval
-- (NULL once ended). `carry` is the sub-nano-dollar remainder (in nano-dollar-ms / 1000)
-- carried between intervals, so splitting time into ticks never changes the total.
-- No foreign keys: a forced workspace delete removes the sandbox row, not its meter.
CREATE TABLE sandbox_meters (
    sandbox_id             TEXT PRIMARY KEY,
    account_id             TEXT NOT NULL,
    workspace_id           TEXT NOT NULL,
    project_id             TEXT NOT NULL,
    vcpus                  INTEGER NOT NULL,
    memory_mib             INTEGER NOT NULL,
    running_nanos_per_sec  INTEGER NOT NULL,
    paused_nanos_per_sec   INTEGER NOT NULL,
    state                  TEXT NOT NULL CHECK (state IN ('running', 'paused', 'ended')),
    billed_until           INTEGER,
    carry                  INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX sandbox_meters_open ON sandbox_meters (account_id) WHERE state != 'ended';
