"""The evaluation app: datasets of questions with expected answers, and experiments that run
them against an agent and score the answers (issue 38, "Evaluation")."""

from django.apps import AppConfig


class EvaluationConfig(AppConfig):
    name = "evaluation"
    verbose_name = "Evaluation"
