-- Template tags: a name for one build of a template (E2B's `name:tag`), which creates
-- naming `name:tag` start from. `default` is no row: it is always the current build. A
-- tagged build's node template is kept (like one a sandbox runs from) until its last tag
-- moves or goes.
CREATE TABLE template_tags (
    template_id TEXT NOT NULL REFERENCES templates(id) ON DELETE CASCADE,
    tag         TEXT NOT NULL,
    build_id    TEXT NOT NULL REFERENCES template_builds(id) ON DELETE CASCADE,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (template_id, tag)
);
CREATE INDEX template_tags_by_build ON template_tags (build_id);
