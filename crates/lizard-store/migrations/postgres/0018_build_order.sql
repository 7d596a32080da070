-- Builds made in the same millisecond keep the order they were made in, on both engines:
-- `seq` grows with each insert (a sequence; on SQLite the row's rowid), and listings
-- order by (created_at, seq). Existing rows are numbered in (created_at, id) order.
ALTER TABLE template_builds ADD COLUMN seq BIGINT;
CREATE SEQUENCE template_builds_seq OWNED BY template_builds.seq;
UPDATE template_builds SET seq = o.n
    FROM (SELECT id, row_number() OVER (ORDER BY created_at, id) AS n FROM template_builds) o
    WHERE template_builds.id = o.id;
SELECT setval('template_builds_seq', COALESCE((SELECT MAX(seq) FROM template_builds), 0) + 1, false);
ALTER TABLE template_builds ALTER COLUMN seq SET DEFAULT nextval('template_builds_seq');
