"""The routes spec (static, dynamic, unrouted) and a task's rows split by route: pure."""
