-- Builds made in the same millisecond keep the order they were made in, on both engines:
-- `seq` grows with each insert (here the row's rowid, set by a trigger; on PostgreSQL a
-- sequence), and listings order by (created_at, seq).
ALTER TABLE template_builds ADD COLUMN seq INTEGER;
UPDATE template_builds SET seq = rowid;
CREATE TRIGGER template_builds_seq AFTER INSERT ON template_builds
BEGIN
    UPDATE template_builds SET seq = NEW.rowid WHERE rowid = NEW.rowid;
END;
