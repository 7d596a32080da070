-- Volume storage is billed: a meter per volume, and a ledger usage kind for it.
-- (SQLite rebuilds the ledger to change its CHECK; PostgreSQL changes the constraint in
-- place, rows, seq and triggers untouched.)
ALTER TABLE ledger DROP CONSTRAINT ledger_usage_kind_check;
ALTER TABLE ledger ADD CONSTRAINT ledger_usage_kind_check
    CHECK (usage_kind IN ('compute', 'paused_storage', 'volume_storage'));

-- One meter per volume, from its create to its delete (volumes outlive server restarts,
-- so their meters do too: storage held while the server was down is billed). Removed
-- when the volume is deleted, after a last bill. `carry` as in sandbox_meters.
CREATE TABLE volume_meters (
    volume_id      TEXT COLLATE "C" PRIMARY KEY,
    account_id     TEXT COLLATE "C" NOT NULL,
    workspace_id   TEXT COLLATE "C" NOT NULL,
    project_id     TEXT COLLATE "C" NOT NULL,
    size_gb        BIGINT NOT NULL,
    nanos_per_sec  BIGINT NOT NULL,
    billed_until   BIGINT NOT NULL,
    carry          BIGINT NOT NULL DEFAULT 0
);
