-- Pause and resume: what a sandbox's timeout does (`kill` or `pause`), and its lifetime,
-- so that a resume can give it the same lifetime again.
ALTER TABLE sandboxes ADD COLUMN on_timeout TEXT NOT NULL DEFAULT 'kill';
ALTER TABLE sandboxes ADD COLUMN timeout_ms INTEGER;
