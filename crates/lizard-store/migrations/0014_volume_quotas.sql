-- GiB of volumes a workspace may hold (within its account's quota, which the server's
-- configuration sets); NULL: the account's quota alone bounds it.
ALTER TABLE workspaces ADD COLUMN volume_quota_gb INTEGER;
