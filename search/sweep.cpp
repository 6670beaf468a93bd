// placeholder until the sweep lands
