-- How many more joins a token allows: tokens minted from now on are single-use unless
-- their creator asks for more; NULL (the tokens minted before) joins until it expires or
-- is revoked, as before.
ALTER TABLE node_tokens ADD COLUMN uses_left INTEGER;
