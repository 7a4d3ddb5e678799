"""Real engines for the end-to-end tests, each installed by the project itself (pinned wheels with
checked digests, cached in the user cache, never outside the repository's own reach)."""
