"""Host-side environments: tasks, tool execution, verification, diagnosis, learning interface."""
