"""rewards/d1"""
