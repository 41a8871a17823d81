-- Replays and forks of recorded jobs (issue 34): a replay names the job it ran again, a
-- fork the job (and turn) its session was copied from.
ALTER TABLE jobs ADD COLUMN replay_of text REFERENCES jobs(id);
ALTER TABLE jobs ADD COLUMN forked_from text REFERENCES jobs(id);
CREATE INDEX jobs_replay_of ON jobs (replay_of) WHERE replay_of IS NOT NULL;
