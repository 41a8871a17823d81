-- Where a request was asked in a chat (issue 31): {channel, chat, id} of the message with
-- its buttons, so that an answer there (a button, a reply) finds its request, and the
-- message is edited with the decision.
ALTER TABLE approvals ADD COLUMN chat_message jsonb;
CREATE INDEX approvals_chat_message ON approvals
    ((chat_message->>'channel'), (chat_message->>'chat'), (chat_message->>'id'))
    WHERE chat_message IS NOT NULL;
