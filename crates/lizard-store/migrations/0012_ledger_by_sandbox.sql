-- What each sandbox has cost so far (`GET /v1/billing/sandboxes`) sums its usage entries:
-- found by sandbox id, not by scanning the account's whole ledger.
CREATE INDEX ledger_sandbox ON ledger (sandbox_id) WHERE sandbox_id IS NOT NULL;
