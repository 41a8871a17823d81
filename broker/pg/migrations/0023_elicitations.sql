-- MCP elicitation (issue 31): a server asks a person during a call. Its request is kind
-- 'elicitation', keyed by the call and a counter (`<call_id>#e<n>`); the server's requested
-- JSON schema is kept to check (and draw a form for) the answer. An answer is 'answered'
-- (its content in `answer`) or 'declined'.
ALTER TABLE approvals ADD COLUMN requested_schema jsonb;
