"""Host-side environments: tasks, tool execution, verification, diagnosis, the learning interface."""
