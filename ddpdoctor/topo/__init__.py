"""topo"""
