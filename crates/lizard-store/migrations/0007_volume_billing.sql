-- Volume storage is billed: a meter per volume, and a ledger usage kind for it.

-- The ledger's usage_kind CHECK gains 'volume_storage'. SQLite cannot change a CHECK in
-- place: the table is rebuilt with every row (seq and ids kept), then its indexes and
-- triggers are made again exactly as migration 0002 made them. The balance trigger is not
-- on the new table while rows are copied, so balances are untouched.
CREATE TABLE ledger_v7 (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,
    id               TEXT NOT NULL UNIQUE,
    account_id       TEXT NOT NULL REFERENCES accounts(id),
    kind             TEXT NOT NULL CHECK (kind IN ('signup_credit', 'credit', 'usage')),
    amount_nanos     INTEGER NOT NULL,
    description      TEXT NOT NULL,
    workspace_id     TEXT,
    project_id       TEXT,
    sandbox_id       TEXT,
    usage_kind       TEXT CHECK (usage_kind IN ('compute', 'paused_storage', 'volume_storage')),
    period_start     INTEGER,
    period_end       INTEGER,
    quantity_ms      INTEGER,
    nanos_per_second INTEGER,
    idempotency_key  TEXT,
    created_at       INTEGER NOT NULL,
    UNIQUE (account_id, idempotency_key)
);
INSERT INTO ledger_v7 (seq, id, account_id, kind, amount_nanos, description, workspace_id, project_id, sandbox_id,
                       usage_kind, period_start, period_end, quantity_ms, nanos_per_second, idempotency_key, created_at)
SELECT seq, id, account_id, kind, amount_nanos, description, workspace_id, project_id, sandbox_id,
       usage_kind, period_start, period_end, quantity_ms, nanos_per_second, idempotency_key, created_at
FROM ledger;
DROP TABLE ledger;
ALTER TABLE ledger_v7 RENAME TO ledger;
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

-- One meter per volume, from its create to its delete (volumes outlive server restarts,
-- so their meters do too: storage held while the server was down is billed). Removed
-- when the volume is deleted, after a last bill. `carry` as in sandbox_meters.
CREATE TABLE volume_meters (
    volume_id      TEXT PRIMARY KEY,
    account_id     TEXT NOT NULL,
    workspace_id   TEXT NOT NULL,
    project_id     TEXT NOT NULL,
    size_gb        INTEGER NOT NULL,
    nanos_per_sec  INTEGER NOT NULL,
    billed_until   INTEGER NOT NULL,
    carry          INTEGER NOT NULL DEFAULT 0
);
