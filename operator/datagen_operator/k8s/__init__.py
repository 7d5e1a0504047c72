"""The Kubernetes shell: kopf handlers, pure manifest builders and observation mapping, the only code that
talks to the API server."""
