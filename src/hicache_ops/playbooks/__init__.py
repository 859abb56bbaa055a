"""The on-call playbooks (Markdown); read them with `hicache playbook list | show | run`."""
