-- Billing: the account ledger, its running balance, and the per-sandbox meters that feed it.
-- PostgreSQL twin of ../0002_billing.sql. Amounts are signed nano-dollars (BIGINT);
-- timestamps are ms.

-- Append-only: every credit and every metered interval is one row, never changed.
-- `seq` orders the ledger (and is the pagination cursor); ids are what clients see.
-- No foreign keys to workspaces, projects or sandboxes: the ledger outlives them.
CREATE TABLE ledger (
    seq              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id               TEXT COLLATE "C" NOT NULL UNIQUE,
    account_id       TEXT COLLATE "C" NOT NULL REFERENCES accounts(id),
    kind             TEXT COLLATE "C" NOT NULL CHECK (kind IN ('signup_credit', 'credit', 'usage')),
    amount_nanos     BIGINT NOT NULL,
    description      TEXT COLLATE "C" NOT NULL,
    workspace_id     TEXT COLLATE "C",
    project_id       TEXT COLLATE "C",
    sandbox_id       TEXT COLLATE "C",
    usage_kind       TEXT COLLATE "C" CONSTRAINT ledger_usage_kind_check CHECK (usage_kind IN ('compute', 'paused_storage')),
    period_start     BIGINT,
    period_end       BIGINT,
    quantity_ms      BIGINT,
    nanos_per_second BIGINT,
    idempotency_key  TEXT COLLATE "C",
    created_at       BIGINT NOT NULL,
    UNIQUE (account_id, idempotency_key)
);
CREATE INDEX ledger_account ON ledger (account_id, seq);
CREATE INDEX ledger_project ON ledger (account_id, project_id) WHERE kind = 'usage';

CREATE FUNCTION ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the ledger is append-only';
END;
$$;
CREATE TRIGGER ledger_no_update BEFORE UPDATE ON ledger FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER ledger_no_delete BEFORE DELETE ON ledger FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
-- TRUNCATE fires no row trigger: refuse it too.
CREATE TRIGGER ledger_no_truncate BEFORE TRUNCATE ON ledger FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();

-- The balance, kept by the database itself in the same statement as each ledger insert,
-- so it equals SUM(ledger.amount_nanos) at every commit. `depleted_at`: when it last
-- reached zero or below (NULL while positive); sandboxes are paused a grace period later.
CREATE TABLE account_balances (
    account_id    TEXT COLLATE "C" PRIMARY KEY REFERENCES accounts(id),
    balance_nanos BIGINT NOT NULL,
    depleted_at   BIGINT
);
CREATE FUNCTION ledger_balance() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO account_balances AS b (account_id, balance_nanos, depleted_at)
    VALUES (NEW.account_id, NEW.amount_nanos, CASE WHEN NEW.amount_nanos <= 0 THEN NEW.created_at END)
    ON CONFLICT (account_id) DO UPDATE SET
        balance_nanos = b.balance_nanos + NEW.amount_nanos,
        depleted_at = CASE
            WHEN b.balance_nanos + NEW.amount_nanos > 0 THEN NULL
            ELSE COALESCE(b.depleted_at, NEW.created_at)
        END;
    RETURN NULL;
END;
$$;
CREATE TRIGGER ledger_balance AFTER INSERT ON ledger FOR EACH ROW EXECUTE FUNCTION ledger_balance();

-- One meter per sandbox: what it costs in each state, and up to when it has been billed.
-- `state` running|paused|ended; `billed_until` is the watermark of the open interval
-- (NULL once ended). `carry` is the sub-nano-dollar remainder (in nano-dollar-ms / 1000)
-- carried between intervals, so splitting time into ticks never changes the total.
-- No foreign keys: a forced workspace delete removes the sandbox row, not its meter.
CREATE TABLE sandbox_meters (
    sandbox_id             TEXT COLLATE "C" PRIMARY KEY,
    account_id             TEXT COLLATE "C" NOT NULL,
    workspace_id           TEXT COLLATE "C" NOT NULL,
    project_id             TEXT COLLATE "C" NOT NULL,
    vcpus                  BIGINT NOT NULL,
    memory_mib             BIGINT NOT NULL,
    running_nanos_per_sec  BIGINT NOT NULL,
    paused_nanos_per_sec   BIGINT NOT NULL,
    state                  TEXT COLLATE "C" NOT NULL CHECK (state IN ('running', 'paused', 'ended')),
    billed_until           BIGINT,
    carry                  BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX sandbox_meters_open ON sandbox_meters (account_id) WHERE state != 'ended';
