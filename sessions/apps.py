from django.apps import AppConfig


class AgentSessionsConfig(AppConfig):
    # The label "sessions" would clash with django.contrib.sessions.
    name = "sessions"
    label = "agent_sessions"
    verbose_name = "Sessions and runs"

    def ready(self) -> None:
        """Fill the ports the lower layers declare: the meter of model calls outside a run's
        turns (``llm.metering``: their LLMCall rows and the tenant's monthly budget,
        :mod:`sessions.llm_calls`), the hand-off of runs and chat titles to workers
        (:mod:`sessions.runs.handoff`) and the publishing of document status changes."""
        from llm.metering import meter_register
        from sessions.llm_calls import LLMCallMeter

        meter_register(LLMCallMeter())
        self._worker_hand_off()
        self._knowledge_status_events()
        self._subrun_engine()
        self._mcp_loop()
        self._connections_made()

    def _connections_made(self) -> None:
        """A connected MCP account resumes the runs whose Connect card waits for it
        (:func:`sessions.runs.approvals.connection_approvals_answer`)."""
        from capabilities.mcp_oauth.services import connection_made_listen
        from sessions.runs.approvals import connection_approvals_answer
        from tenants.scoping import tenant_scope

        def answer(*, tenant_id: int, server_id: int, user_id: int | None, actor) -> None:
            with tenant_scope(tenant_id):
                connection_approvals_answer(server_id=server_id, user_id=user_id, actor=actor)

        connection_made_listen(answer)

    def _mcp_loop(self) -> None:
        """MCP requests a worker makes outside runs (the chat app's prompts) run on the run host's
        loop, sharing its MCP pool (:mod:`capabilities.mcp_worker`)."""
        from capabilities.mcp_worker import mcp_loop_register

        def on_run_host(coro):
            from sessions.runner.host import run_host

            return run_host().run(coro)

        mcp_loop_register(on_run_host)

    def _subrun_engine(self) -> None:
        """A skill's sub-run runs on the run loop, with the production ports outside a run
        (:class:`sessions.runner.subrun.SubrunEngine`; the sub-run's module imports neither)."""
        from sessions.runner.adapters import production_ports
        from sessions.runner.loop import run_loop_cancellable
        from sessions.runner.subrun import SubrunEngine, subrun_engine_register

        subrun_engine_register(SubrunEngine(run_loop=run_loop_cancellable, production_ports=production_ports))

    def _worker_hand_off(self) -> None:
        """Runs and chats are handed to workers by :mod:`sessions.tasks`' Celery senders
        (``run_enqueue``, ``chat_title_enqueue``). Each call looks the sender up on the module,
        so a test's or benchmark's patch of ``sessions.tasks.run_enqueue`` applies."""
        from sessions import tasks
        from sessions.runs.handoff import WorkerHandOff, workers_register

        def run(run_id: int, tenant_id: int | None = None) -> None:
            tasks.run_enqueue(run_id, tenant_id)

        def chat_title(*, session_id: int, run_id: int, tenant_id: int) -> None:
            tasks.chat_title_enqueue(session_id=session_id, run_id=run_id, tenant_id=tenant_id)

        workers_register(WorkerHandOff(run=run, chat_title=chat_title))

    def _knowledge_status_events(self) -> None:
        """Publish document status changes to the chat a document was added from
        (:func:`sessions.knowledge_uploads.document_status_publish`)."""
        from knowledge.document_status import document_status_listen
        from sessions.knowledge_uploads import document_status_publish

        document_status_listen(document_status_publish)
