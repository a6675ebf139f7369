"""The server helpers of the OpenAI tests, shared here."""

from tests.entrypoints.openai.conftest import chat_template_file  # noqa: F401
