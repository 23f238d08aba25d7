// Anchors the precompiled header shared by the torch-heavy targets.
