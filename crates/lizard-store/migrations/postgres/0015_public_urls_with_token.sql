-- A sandbox made through E2B's API has an access token (its envd and traffic tokens are
-- derived from the token's hash) even when its URLs are public, as E2B's are by
-- default: the row then says so, and the proxy lets its URLs through without a token.
-- `resume_on_request`: a request to its URLs resumes it when paused (E2B's autoResume).
ALTER TABLE sandbox_access ADD COLUMN urls_public BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE sandbox_access ADD COLUMN resume_on_request BOOLEAN NOT NULL DEFAULT FALSE;
