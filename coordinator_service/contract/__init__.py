"""What a writer shares with the coordinator: the answers (views) and their wire mapping, the client, the errors,
the names and flag values both sides check, the generated gRPC code. It imports only the base dependencies (the
writer's side installs nothing else)."""
