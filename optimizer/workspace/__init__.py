"""The workspace and its plumbing, below every other engine package but the vocabulary's leaves.

- `workspace`: a workspace (a git repository holding judgeloop.toml, prompts/, devset/ and experiments/),
  finding its root, one short-lived ``Repo`` per operation, the loop's lock;
- `config`: ``judgeloop.toml``, validated with pydantic;
- `paths`: the one path rule for the files the loop may edit, the workspace's file names, writes that
  never follow a link;
- `storage`: storage faults (a full disk, a read-only folder, a corrupt SQLite file) as one-line errors;
- `gitops`: the git operations of a run (its branch, candidate commits, keep, roll back, scratch worktrees).
"""
