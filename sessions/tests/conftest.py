from channels.db import database_sync_to_async as sync_to_async

import sessions.tests.tools_for_tests  # noqa: F401  (registers test_echo / test_sleep)
from sessions.models import Run
from sessions.services import chat_session_create, message_post
from tenants.scoping import tenant_scope


def post_message_sync(*, agent, user, content: str, session=None) -> Run:
    with tenant_scope(agent.tenant_id):
        session = session or chat_session_create(user=user, agent=agent)
        return message_post(session=session, user=user, content=content)


post_message = sync_to_async(post_message_sync)


@sync_to_async
def reload_run(run_id: int) -> Run:
    return Run.all_tenants.get(pk=run_id)
