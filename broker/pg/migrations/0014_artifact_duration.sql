-- Audio and video artifacts carry their decoded length.
ALTER TABLE artifacts ADD COLUMN duration_s real;
